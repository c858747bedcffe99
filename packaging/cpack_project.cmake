# Read by cpack (CPACK_PROJECT_CONFIG_FILE) before it makes the packages.
# GENERATE_SHLIBS looks at every shared object of every package and warns
# that bs_blkps.so has no SONAME: a tgt plugin is loaded by path and never
# has one, so cpack's developer warnings are off.
set(CMAKE_SUPPRESS_DEVELOPER_WARNINGS ON)

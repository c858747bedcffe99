/* BLKPS_EXPORT marks what libblkps.so exports: the C API (blkps/blkps.h) and
 * the C++ classes of blkps/ (Model, Engine). libblkps is compiled with hidden
 * visibility, so everything else (devices, the transfer planner, the stripe
 * map) stays internal; programs that need those link the static library
 * blkps_internal in the build tree instead. */

#ifndef BLKPS_EXPORT_H_
#define BLKPS_EXPORT_H_

#define BLKPS_EXPORT __attribute__((visibility("default")))

#endif /* BLKPS_EXPORT_H_ */

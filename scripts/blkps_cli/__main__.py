"""Runs the `blkps` command: `python3 scripts/blkps_cli/__main__.py ARGS`
(what scripts/blkps does) or `python3 -m blkps_cli ARGS`. Imports only the
standard library until a subcommand needs more."""
import os
import sys

if __package__ in (None, ""):  # run as a file: the package is this folder
    scripts = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    sys.path[:] = [scripts] + [p for p in sys.path if os.path.realpath(p or ".") != os.path.join(scripts, "blkps_cli")]
    from blkps_cli.main import main
else:
    from .main import main

sys.exit(main())

"""Runs the `blkps` command: `python3 scripts/blkps_cli/__main__.py ARGS`
(what scripts/blkps does) or `python3 -m blkps_cli ARGS`. Imports only the
standard library until a subcommand needs more."""
import os
import sys

if __package__ in (None, ""):  # run as a file: import the package from its parent folder
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or ".") == here:
        del sys.path[0]  # this folder's modules are the package's, not top-level ones
    sys.path.insert(0, os.path.dirname(here))
    from blkps_cli.main import main
else:
    from .main import main

sys.exit(main())

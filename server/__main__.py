"""`python -m server [flags]`: command line -> Settings -> run the server until SIGTERM/SIGINT."""

from __future__ import annotations

import sys

from server.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))

"""`python -m treeopt`: the command line, with Ctrl-C while it starts said in one line too."""

import sys

try:
    from treeopt.cli import main
except KeyboardInterrupt:  # pressed while the command line imports (its first ~0.3 s)
    print("treeopt: interrupted", file=sys.stderr)
    sys.exit(130)

main()

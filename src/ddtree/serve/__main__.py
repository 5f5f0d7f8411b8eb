import sys

from ddtree.serve.cli import main

sys.exit(main())

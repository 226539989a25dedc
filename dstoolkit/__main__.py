import sys

from dstoolkit.cli import main

sys.exit(main())

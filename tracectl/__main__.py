import sys

from tracectl.cli import main

sys.exit(main())

import sys

from polytrain.cli import main

sys.exit(main())

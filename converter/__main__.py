import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while starting up: nothing was done yet
    sys.exit(130)

sys.exit(main())

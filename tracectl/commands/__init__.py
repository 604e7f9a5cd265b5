"""tracectl subcommands; each module exposes `register(subparsers)`."""

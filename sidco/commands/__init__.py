"""One module per ``sidco`` subcommand; each exposes ``register(subparsers)``."""

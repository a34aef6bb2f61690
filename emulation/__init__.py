"""emulation package."""

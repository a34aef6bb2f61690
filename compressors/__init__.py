"""compressors package."""

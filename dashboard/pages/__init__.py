"""The dashboard's pages; each module exposes PATH, TITLE, layout(reader) and register(app, reader, ...)."""

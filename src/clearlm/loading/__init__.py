"""Weight loading: one module per file format."""

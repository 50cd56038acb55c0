"""HTTP routers of the execbox service (one module per API surface)."""

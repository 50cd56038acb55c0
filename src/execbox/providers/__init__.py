"""Sandbox providers: the contract, the registry and one module per backend."""

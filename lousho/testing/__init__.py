"""Test helpers shipped with lousho: the store contract suite and a private Redis server."""

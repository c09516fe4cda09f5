"""The mappings the mapping store is tested on (issue #16): a dict, a `shelve` file and a `dbm` file."""

from __future__ import annotations

import shelve
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lousho.stores.mapping import MappingStore, dbm_store, mapping_store

MAPPINGS = ["dict", "shelve", "dbm"]


@contextmanager
def mapping_stores(kind: str, folder: Path) -> Iterator[Callable[..., MappingStore]]:
    """A factory of fresh mapping stores of one kind (each on a mapping of its own); all closed at the end."""
    made: list[tuple[MappingStore, Any]] = []

    def make(**options: Any) -> MappingStore:
        path = folder / f"{kind}-{len(made)}"
        if kind == "dict":
            store, mapping = mapping_store({}, **options), None
        elif kind == "shelve":
            mapping = shelve.open(str(path))  # noqa: SIM115 - closed when the factory ends
            store = mapping_store(mapping, **options)
        else:
            store, mapping = dbm_store(path, **options), None
        made.append((store, mapping))
        return store

    try:
        yield make
    finally:
        for store, mapping in made:
            store.close()
            if mapping is not None:
                mapping.close()

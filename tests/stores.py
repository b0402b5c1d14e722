"""The store an App opened, whole, for the tests that act on it as the actors do."""

from __future__ import annotations

import stepwarden as sw
from stepwarden.store import Store


async def app_store(app: sw.App) -> Store:
    """The App's store with every role's calls (`App.store()` gives only the application's
    and the reads, `store.ports.ApplicationStore`): a test acts on it as a scheduler, an
    agent or the supervisor would, as a worker does on the store it opens."""
    store = await app.store()
    assert isinstance(store, Store)
    return store

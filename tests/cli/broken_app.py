"""An application module whose import fails inside stepwarden: its App names a store URL that
stepwarden refuses (as a deployment with a mistyped URL in its settings would)."""

from __future__ import annotations

import stepwarden as sw

app = sw.App("broken", store="mysql://db.example/shop")

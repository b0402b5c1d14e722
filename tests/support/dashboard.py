"""What the dashboard's tests share."""

from __future__ import annotations

AGENTS = "SELECT instance, capacity FROM stepwarden_agents WHERE agent = 'desk'"

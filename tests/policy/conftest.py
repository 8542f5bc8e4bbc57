"""Keeps the user's environment and config file out of the policy tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _clean(clean_settings: None) -> None:
    """Every policy test reads settings from nothing but its own arguments."""

"""Request and response schemas of the public API (../shared/API.md)."""

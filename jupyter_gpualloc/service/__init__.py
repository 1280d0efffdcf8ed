"""The scheduler core behind HTTP: tornado app, REST API v1, auth, metrics and events."""

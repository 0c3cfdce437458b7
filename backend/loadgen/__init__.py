"""Load generator: replays a Mooncake-format trace against the REST API's native endpoint."""

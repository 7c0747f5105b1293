"""Reaching Temporal and Postgres, from either side: the settings a client needs
(``settings``), Temporal's client configuration with TLS, mTLS and API keys
(``temporal_config``), encrypted payloads (``payload_codec``), and the connections
themselves (``connections``)."""

"""Admin API and access control: the policy over API groups (admin token, API keys, restricted APIs) and TLS."""

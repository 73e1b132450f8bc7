"""The contracts: wire events and their schemas, the effective history's shape, tool pairing."""

"""Starting real agent processes on loopback and driving them over gRPC, for tests."""

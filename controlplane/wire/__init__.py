"""The wire contract (protobuf package ``moeplane.v1``): generated modules and the array codec."""

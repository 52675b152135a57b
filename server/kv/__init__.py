"""KV memory by the token: the arena's regions, the prefix cache over them and the tensors that hold them."""

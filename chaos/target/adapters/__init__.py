"""Third-party checkpointers wrapped in the harness's protocol, used the way teams use them."""

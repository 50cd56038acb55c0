"""Host side of self-hosted boxes: agent client, box handles, warm pool."""

"""Network egress for boxes: policy model, the gateway (DNS + policed connections), audit, limits."""

"""Walk step 3, collectives in isolation: how many collectives a step makes, their payloads, and the TP break-even."""

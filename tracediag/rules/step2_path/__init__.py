"""Walk step 2, the physical path: the link class between the ranks and the bus bandwidth achieved on it."""

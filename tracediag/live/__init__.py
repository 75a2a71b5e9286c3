"""Recording from live systems: the GPU topology snapshot (`tracediag env`, NVML) and timestamped
`/metrics` scrapes of a running engine (`tracediag scrape`)."""

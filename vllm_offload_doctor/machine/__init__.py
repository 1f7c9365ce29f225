"""What check and compare read from this host: probes (NVML, /proc, interpreters), the PCIe link, ports, model sizes and the fit model."""

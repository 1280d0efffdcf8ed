"""Background jobs' runner: executes granted jobs with nbclient in fresh kernels, hosted by the owner's server."""

int device_memory_plugin(void) { return 1; }

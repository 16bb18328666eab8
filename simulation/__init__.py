"""Event-driven engines that drive control/ policies: the emulated warehouse and its simulator."""

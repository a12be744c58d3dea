"""DIRP's test bed: the anti-mimicry protections it purifies, the purifiers it is compared with, the mimicry test."""

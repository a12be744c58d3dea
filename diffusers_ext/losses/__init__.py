"""Training losses: distances between images and the consistency-training objectives built on them."""

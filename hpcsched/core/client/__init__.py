"""The client: futures, collections, coordination, datasets, and the client inside tasks."""

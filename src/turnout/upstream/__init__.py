"""HTTP clients for workers. aiohttp client exceptions never leave this package."""

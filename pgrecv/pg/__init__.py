"""PostgreSQL itself: connections, slots and publications, type OIDs, throwaway servers."""

"""Who a request belongs to: tenant, project and session."""

"""ModelClaim controllers: drivers that feed the pure reconcile plan and apply its actions."""

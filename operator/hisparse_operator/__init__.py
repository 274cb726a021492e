"""hisparse operator: API, render, controller and the `hisparse` CLI."""

"""What the tests share: builders of records (unit), the harness that runs real jobs and daemons
(integration, security, bench), and fixtures the tiers' conftests hand out. No tests here."""

"""For people (CLI and coordinator processes, stdlib only): an incident as one self-contained HTML
page, the web view's pages of jobs and ranks, and incidents and jobs as a terminal's text
(`terminal`). Every worker-supplied string is escaped here.
"""

from watchdog.report.incident_page import incident_html, write_html
from watchdog.report.job_pages import error_page, job_page, jobs_page, login_page

__all__ = ["error_page", "incident_html", "job_page", "jobs_page", "login_page", "write_html"]

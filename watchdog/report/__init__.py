"""HTML for people (CLI and coordinator processes, stdlib only): an incident as one self-contained
page, and the web view's pages of jobs and ranks. Every worker-supplied string is escaped here.
"""

from watchdog.report.incident_page import incident_html, write_html
from watchdog.report.job_pages import error_page, job_page, jobs_page, login_page

__all__ = ["error_page", "incident_html", "job_page", "jobs_page", "login_page", "write_html"]

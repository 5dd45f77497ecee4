"""The shapewatch dashboard: ``streamlit run dashboard/app.py`` (or ``shapewatch dashboard --url URL``).

The entry point is a frame around the pages: optional OIDC login, the
navigation, and a sidebar with the service it talks to and the name written
on acknowledgements, silences and baselines. Each page is one module under
``views/``; all data comes from the service's HTTP API.

Login: when ``.streamlit/secrets.toml`` has an ``[auth]`` section (Streamlit's
OIDC settings: ``redirect_uri``, ``cookie_secret``, ``client_id``,
``client_secret``, ``server_metadata_url``) and Authlib is installed, the app
asks for a login (``st.login``) first; without it the app is open to whoever
reaches its port (it binds what ``streamlit run`` binds).
"""

from __future__ import annotations

import streamlit as st
from streamlit.errors import StreamlitSecretNotFoundError

from shapewatch.dashboard import ui


def _auth_configured() -> bool:
    try:
        return "auth" in st.secrets
    except (StreamlitSecretNotFoundError, FileNotFoundError):
        return False


st.set_page_config(page_title="shapewatch", page_icon=":material/monitoring:", layout="wide")

if _auth_configured() and not st.user.get("is_logged_in"):
    st.title("shapewatch")
    st.write("Sign in to see the alerts, cohorts and baselines.")
    st.button("Log in", on_click=st.login, type="primary")
    st.stop()

pages = [
    st.Page("views/alerts.py", title="Alerts", icon=":material/notifications_active:", default=True),  # at /
    st.Page("views/cohorts.py", title="Cohorts", icon=":material/group_work:", url_path="cohorts"),
    st.Page("views/field.py", title="Field detail", icon=":material/show_chart:", url_path="field"),
    st.Page("views/baselines.py", title="Baselines and review", icon=":material/fact_check:", url_path="baselines"),
    st.Page("views/contracts.py", title="Contracts", icon=":material/description:", url_path="contracts"),
    st.Page("views/runs.py", title="Agent runs", icon=":material/timeline:", url_path="runs"),
    st.Page("views/cases.py", title="Cases to review", icon=":material/rule:", url_path="cases"),
    st.Page("views/ingestion.py", title="Ingestion health", icon=":material/input:", url_path="ingestion"),
    st.Page("views/probes.py", title="Probes", icon=":material/science:", url_path="probes"),
    st.Page("views/compare.py", title="Compare cohorts", icon=":material/compare_arrows:", url_path="compare"),
]
page = st.navigation(pages)

with st.sidebar:
    try:
        settings = ui.session().settings
        st.caption(f"Service: {ui.literal(settings.url)}" + (" (with a token)" if settings.token else ""))
        default_author = settings.author
    except ValueError as exc:  # SettingsInvalid: the page says so in full
        st.caption(ui.literal(exc))
        default_author = ""
    if st.user.get("is_logged_in"):
        default_author = str(st.user.get("email") or st.user.get("name") or default_author)
    if "author" not in st.session_state:
        st.session_state["author"] = default_author
    st.text_input("Your name", key="author", help="Written on acknowledgements, silences and baselines.")
    if st.button("Refresh now", icon=":material/refresh:"):
        st.cache_data.clear()
    if st.user.get("is_logged_in"):
        st.button("Log out", on_click=st.logout)

page.run()

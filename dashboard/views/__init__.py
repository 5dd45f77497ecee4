"""The dashboard's pages, one module each; ``app.py`` runs them through ``st.navigation``."""

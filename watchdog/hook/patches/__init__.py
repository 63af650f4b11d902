"""The torch patches (run inside every training rank): one wrapper per patched torch API, each
reporting through the recorder's own methods; `install.TorchPatches` puts them in place."""

"""Settings: the server, the model, sampling, and warmstart's thresholds."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from ...core.preferences import Preferences
from ...core.types import Sampling, ServerSetting

DEFAULT_MODEL_LABEL = "The server's default model"


class SettingsDialog(QDialog):
    def __init__(self, prefs: Preferences, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.resize(720, 480)
        self._prefs = prefs
        tabs = QTabWidget()
        tabs.addTab(self._server_tab(prefs), "Server")
        tabs.addTab(self._model_tab(prefs), "Model")
        tabs.addTab(self._thresholds_tab(), "Thresholds")
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(tabs)
        layout.addWidget(buttons)

    def _server_tab(self, prefs: Preferences) -> QWidget:
        tab = QWidget()
        form = QFormLayout(tab)
        self.base_url = QLineEdit(prefs.base_url)
        self.api_key = QLineEdit(prefs.api_key)
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("only for a server you run yourself")
        self.autostart = QCheckBox("Start a local server (and trust no other on this machine)")
        self.autostart.setChecked(prefs.autostart)
        form.addRow("Server URL", self.base_url)
        form.addRow("API key", self.api_key)
        form.addRow("", self.autostart)
        hint = QLabel("Any OpenAI-compatible server works; the memory panel needs warmstart.")
        hint.setObjectName("muted")
        form.addRow("", hint)
        return tab

    def _model_tab(self, prefs: Preferences) -> QWidget:
        tab = QWidget()
        form = QFormLayout(tab)
        # Picking a model is the Models panel's: it asks the server to load it and says
        # when that fails (a name typed here, or a GGUF path, made every send a 404).
        self.model_note = QLabel(
            f"{prefs.model or DEFAULT_MODEL_LABEL}. Switch or download models in the "
            "Models panel (View → Models, Ctrl+Shift+M)."
        )
        self.model_note.setWordWrap(True)
        form.addRow("Model", self.model_note)
        s = prefs.sampling
        self.temperature = self._double(0.0, 2.0, 0.05, s.temperature)
        self.top_p = self._double(0.0, 1.0, 0.01, s.top_p)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.max_tokens.setValue(s.max_tokens)
        self.seed = QSpinBox()
        self.seed.setRange(-1, 2**31 - 1)
        self.seed.setSpecialValueText("random")
        self.seed.setValue(-1 if s.seed is None else s.seed)
        self.system_prompt = QPlainTextEdit(prefs.system_prompt)
        self.system_prompt.setPlaceholderText("optional; shared by every conversation")
        form.addRow("Temperature", self.temperature)
        form.addRow("Top p", self.top_p)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Seed", self.seed)
        form.addRow("System prompt", self.system_prompt)
        return tab

    def _thresholds_tab(self) -> QWidget:
        tab = QWidget()
        layout = QVBoxLayout(tab)
        self.thresholds_note = QLabel("Asking the server what it chose…")
        self.thresholds_note.setWordWrap(True)
        layout.addWidget(self.thresholds_note)
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["Setting", "Automatic", "Why", "Override"])
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().hide()
        layout.addWidget(self.table)
        return tab

    @staticmethod
    def _double(lo: float, hi: float, step: float, value: float) -> QDoubleSpinBox:
        box = QDoubleSpinBox()
        box.setRange(lo, hi)
        box.setSingleStep(step)
        box.setDecimals(2)
        box.setValue(value)
        return box

    # -- fed by the caller -------------------------------------------------------------

    def set_server_settings(self, settings: dict[str, ServerSetting] | None) -> None:
        if settings is None:
            self.thresholds_note.setText(
                "This server does not report warmstart's thresholds (not a warmstart server)."
            )
            return
        self.thresholds_note.setText(
            "Chosen automatically from this machine. An override applies when the app starts "
            "the local server (WARMSTART_<NAME>); leave it empty to keep the automatic value."
        )
        self.table.setRowCount(len(settings))
        for row, (name, s) in enumerate(sorted(settings.items())):
            for col, text in enumerate((name, str(s.value), s.reason)):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
                self.table.setItem(row, col, item)
            self.table.setItem(row, 3, QTableWidgetItem(self._prefs.overrides.get(name, "")))
        self.table.resizeColumnsToContents()

    def preferences(self) -> Preferences:
        overrides = dict(self._prefs.overrides)
        for row in range(self.table.rowCount()):
            name_item, value_item = self.table.item(row, 0), self.table.item(row, 3)
            if name_item is None:
                continue
            value = value_item.text().strip() if value_item else ""
            if value:
                overrides[name_item.text()] = value
            else:
                overrides.pop(name_item.text(), None)
        seed = self.seed.value()
        return replace(
            self._prefs,
            base_url=self.base_url.text().strip() or self._prefs.base_url,
            api_key=self.api_key.text().strip(),
            autostart=self.autostart.isChecked(),
            sampling=Sampling(
                temperature=self.temperature.value(),
                top_p=self.top_p.value(),
                max_tokens=self.max_tokens.value(),
                seed=None if seed < 0 else seed,
                stop=self._prefs.sampling.stop,
            ),
            system_prompt=self.system_prompt.toPlainText().strip(),
            overrides=overrides,
        )

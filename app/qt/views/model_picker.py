"""The model picker: installed and catalogue models with size and fit, the buttons to
use or download one, and a download's progress. Layout only: actions leave as signals."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal, SignalInstance
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...core.models import FIT_LABELS, ModelInfo

STATES = ("State", "loading…", "downloading…", "in use", "installed")

COLUMNS = ("Model", "Size", "Fits", "State")
NameRole = Qt.ItemDataRole.UserRole
# The widest text each fixed column can hold, so that no switch, load or download
# changes a width (a column sized to its contents grew and pushed State out of sight).
WIDEST: dict[int, tuple[str, ...]] = {
    1: ("Size", "999.9 MB"),
    2: ("Fits", *FIT_LABELS.values()),
    3: STATES,
}
CELL_PADDING = 20  # the Fusion style's margins around a cell's text, and some air


class ModelPicker(QWidget):
    use_requested = Signal(str)
    download_requested = Signal(str)
    cancel_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.models: list[ModelInfo] = []
        self.current = ""
        self.loading = ""
        self.downloading = ""
        self.can_download = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self.current_label = QLabel()
        self.current_label.setWordWrap(True)
        layout.addWidget(self.current_label)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().hide()
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in WIDEST:
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.Fixed)
        self._fit_columns()
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.cellDoubleClicked.connect(lambda _r, _c: self._activate())
        layout.addWidget(self.table, 1)
        buttons = QHBoxLayout()
        self.use_button = QPushButton("Use")
        self.use_button.clicked.connect(lambda: self._emit(self.use_requested))
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(lambda: self._emit(self.download_requested))
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.clicked.connect(self.cancel_requested)
        for b in (self.use_button, self.download_button, self.cancel_button):
            buttons.addWidget(b)
        layout.addLayout(buttons)
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        layout.addWidget(self.progress)
        self.note = QLabel()
        self.note.setObjectName("muted")
        self.note.setWordWrap(True)
        layout.addWidget(self.note)
        self._update_buttons()

    # -- fed by the controller ---------------------------------------------------------

    def set_models(self, models: list[ModelInfo]) -> None:
        selected = self.selected()
        self.models = list(models)
        self.table.setRowCount(len(self.models))
        for row, m in enumerate(self.models):
            tip = "\n".join(t for t in (m.title, m.fit_reason) if t)
            for col, text in enumerate((m.name, m.size_label, m.fit_label, self._state(m))):
                item = QTableWidgetItem(text)
                item.setData(NameRole, m.name)
                item.setToolTip(tip)
                self.table.setItem(row, col, item)
        self._fit_columns()
        self.select(selected)
        self._update_buttons()

    def set_current(self, name: str) -> None:
        self.current = name
        self._refresh_states()

    def set_loading(self, name: str) -> None:
        self.loading = name
        self._refresh_states()

    def set_can_download(self, can: bool) -> None:
        self.can_download = can
        self.note.setText(
            ""
            if can
            else "Downloads go to the local server the app starts; this server is not one."
        )
        self._update_buttons()

    def set_download(self, name: str, fraction: float | None) -> None:
        """Progress of ``name``'s download; ``""`` when none runs."""
        self.downloading = name
        if name:
            self.progress.setRange(0, 0 if fraction is None else 1000)
            if fraction is not None:
                self.progress.setValue(round(fraction * 1000))
            self.progress.setFormat(f"{name}: %p%" if fraction is not None else name)
        self._refresh_states()

    # -- selection ---------------------------------------------------------------------

    def select(self, name: str | None) -> None:
        row = next((i for i, m in enumerate(self.models) if m.name == name), -1)
        if row >= 0:
            self.table.selectRow(row)
        else:
            self.table.clearSelection()

    def selected(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        return self.models[rows[0].row()].name if rows else None

    def _selected_info(self) -> ModelInfo | None:
        name = self.selected()
        return next((m for m in self.models if m.name == name), None)

    # -- internals ---------------------------------------------------------------------

    def _text_width(self, texts: tuple[str, ...] | list[str]) -> int:
        metrics = self.table.fontMetrics()
        return max((metrics.horizontalAdvance(t) for t in texts), default=0) + CELL_PADDING

    def _fit_columns(self) -> None:
        """Fixed columns as wide as their widest possible text; the names' column takes
        the rest, and the table is never narrower than its longest name needs (the dock
        cannot squeeze it into "smollm2-13…" nor hide a column behind a scrollbar)."""
        fixed = 0
        for col, texts in WIDEST.items():
            width = self._text_width(texts)
            self.table.setColumnWidth(col, width)
            fixed += width
        names = self._text_width(["Model", *(m.name for m in self.models)])
        chrome = 2 * self.table.frameWidth() + self.table.verticalScrollBar().sizeHint().width()
        self.table.setMinimumWidth(names + fixed + chrome)

    def names_fit(self) -> bool:
        """Every name shows whole and every column is in view (for tests and checks)."""
        header = self.table.horizontalHeader()
        inside = header.sectionPosition(3) + header.sectionSize(3) <= header.width()
        need = self._text_width([m.name for m in self.models]) - CELL_PADDING // 2
        return inside and need <= header.sectionSize(0)

    def _state(self, m: ModelInfo) -> str:
        if m.name == self.loading:
            return "loading…"
        if m.name == self.downloading:
            return "downloading…"
        if m.name == self.current:
            return "in use"
        return "installed" if m.installed else ""

    def _refresh_states(self) -> None:
        for row, m in enumerate(self.models):
            item = self.table.item(row, 3)
            if item is not None:
                item.setText(self._state(m))
        shown = self.current or "the server's default model"
        text = f"In use: {shown}"
        if self.loading:
            text = f"Loading {self.loading}… (sending waits until it is loaded)"
        self.current_label.setText(text)
        self.progress.setVisible(bool(self.downloading))
        self._update_buttons()

    def _update_buttons(self) -> None:
        m = self._selected_info()
        idle = not self.loading
        self.use_button.setEnabled(
            idle and m is not None and m.installed and m.name != self.current
        )  # fmt: skip
        self.download_button.setEnabled(
            self.can_download and not self.downloading and m is not None and not m.installed
        )
        self.cancel_button.setVisible(bool(self.downloading))
        self.progress.setVisible(bool(self.downloading))

    def _emit(self, signal: SignalInstance) -> None:
        name = self.selected()
        if name:
            signal.emit(name)

    def _activate(self) -> None:
        if self.use_button.isEnabled():
            self.use_button.click()
        elif self.download_button.isEnabled():
            self.download_button.click()

<#
.SYNOPSIS
  warmstart on Windows for one user (no administrator rights). UNTESTED: written for
  Windows 10/11 x64 but never run on Windows by the project; reports welcome.

.DESCRIPTION
  Requirements, checked before anything is installed:
  - Python 3.11 or newer from python.org (the "py" launcher) or the Microsoft Store.
  - Visual Studio 2022 Build Tools with the "Desktop development with C++" workload
    (MSVC and the Windows SDK): llama-cpp-python ships only as source and compiles
    llama.cpp for 10 to 20 minutes. Install them with:
      winget install Microsoft.VisualStudio.2022.BuildTools --override "--wait --passive --add Microsoft.VisualStudio.Workload.VCTools --includeRecommended"
    CMake and Ninja come from pip; nothing else is needed.
  - For an NVIDIA GPU (optional): the CUDA Toolkit (nvcc on PATH) and a driver;
    -Cuda forces the CUDA build, otherwise it is chosen when nvcc and nvidia-smi answer.

  Where everything lives (platformdirs' Windows locations, as warmstart reads them):
    program        %LOCALAPPDATA%\warmstart\venv
    command        %LOCALAPPDATA%\warmstart\bin\warmstart.cmd (added to your user PATH)
    models, KV cache, conversations, settings (warmstart.toml)   %LOCALAPPDATA%\warmstart
    Start menu     %APPDATA%\Microsoft\Windows\Start Menu\Programs\warmstart.lnk
    API at logon   the scheduled task "warmstart API" (-Service)

.EXAMPLE
  powershell -ExecutionPolicy Bypass -File installers\windows\install.ps1
  powershell -ExecutionPolicy Bypass -File installers\windows\install.ps1 -Service
  powershell -ExecutionPolicy Bypass -File installers\windows\install.ps1 -Upgrade
  powershell -ExecutionPolicy Bypass -File installers\windows\install.ps1 -Uninstall [-Purge]
#>
[CmdletBinding()]
param(
    [switch]$Service,
    [switch]$Upgrade,
    [switch]$Uninstall,
    [switch]$Purge,
    [switch]$Cuda,
    [switch]$Cpu,
    [switch]$NoModel,
    [string]$Source = (Resolve-Path (Join-Path $PSScriptRoot "..\..")).Path,
    [string]$Python = ""
)
$ErrorActionPreference = "Stop"

$Home_ = Join-Path $env:LOCALAPPDATA "warmstart"
$Venv = Join-Path $Home_ "venv"
$BinDir = Join-Path $Home_ "bin"
$Shim = Join-Path $BinDir "warmstart.cmd"
$Shortcut = Join-Path $env:APPDATA "Microsoft\Windows\Start Menu\Programs\warmstart.lnk"
$TaskName = "warmstart API"
$Exe = Join-Path $Venv "Scripts\warmstart.exe"

function Say($msg) { Write-Host "==> $msg" }

function Set-UserPath([bool]$add) {
    $path = [Environment]::GetEnvironmentVariable("Path", "User")
    $parts = @($path -split ";" | Where-Object { $_ -and $_ -ne $BinDir })
    if ($add) { $parts += $BinDir }
    [Environment]::SetEnvironmentVariable("Path", ($parts -join ";"), "User")
}

function Remove-Warmstart {
    Say "removing warmstart (program, command, Start menu entry, scheduled task)"
    if (Get-ScheduledTask -TaskName $TaskName -ErrorAction SilentlyContinue) {
        Stop-ScheduledTask -TaskName $TaskName -ErrorAction SilentlyContinue
        Unregister-ScheduledTask -TaskName $TaskName -Confirm:$false
    }
    Remove-Item -Force -ErrorAction SilentlyContinue $Shortcut, $Shim
    if (Test-Path $BinDir) { Remove-Item -Recurse -Force $BinDir }
    if (Test-Path $Venv) { Remove-Item -Recurse -Force $Venv }
    Set-UserPath $false
    if ($Purge) {
        Say "purging models, KV cache, conversations and settings"
        if (Test-Path $Home_) { Remove-Item -Recurse -Force $Home_ }
    } else {
        Write-Host "    kept your data in $Home_ (-Uninstall -Purge removes it)"
    }
}

function Find-Python {
    $candidates = @()
    if ($Python) { $candidates += ,@($Python) }
    $candidates += ,@("py", "-3.13"), ,@("py", "-3.12"), ,@("py", "-3.11"), ,@("python")
    foreach ($c in $candidates) {
        $exe = $c[0]; $rest = @($c | Select-Object -Skip 1)
        if (-not (Get-Command $exe -ErrorAction SilentlyContinue)) { continue }
        & $exe @rest -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>$null
        if ($LASTEXITCODE -eq 0) { return ,$c }
    }
    throw "Python 3.11 or newer was not found: install it from python.org (tick 'py launcher')"
}

function Assert-BuildTools {
    $vswhere = Join-Path ${env:ProgramFiles(x86)} "Microsoft Visual Studio\Installer\vswhere.exe"
    $found = $null
    if (Test-Path $vswhere) {
        $found = & $vswhere -latest -products * `
            -requires Microsoft.VisualStudio.Component.VC.Tools.x86.x64 -property installationPath
    }
    if (-not $found) {
        throw ("llama-cpp-python compiles from source and needs the Visual Studio 2022 Build " +
            "Tools with the C++ workload. Install them, then run this again:`n  winget install " +
            "Microsoft.VisualStudio.2022.BuildTools --override `"--wait --passive --add " +
            "Microsoft.VisualStudio.Workload.VCTools --includeRecommended`"")
    }
}

function Want-Cuda {
    if ($Cpu) { return $false }
    if ($Cuda) { return $true }
    if (-not (Get-Command nvcc -ErrorAction SilentlyContinue)) { return $false }
    if (-not (Get-Command nvidia-smi -ErrorAction SilentlyContinue)) { return $false }
    & nvidia-smi -L *> $null
    return ($LASTEXITCODE -eq 0)
}

function Install-Program {
    $py = Find-Python
    Assert-BuildTools
    if (-not (Test-Path (Join-Path $Venv "Scripts\python.exe"))) {
        Say "creating the virtual environment $Venv"
        $exe = $py[0]; $rest = @($py | Select-Object -Skip 1)
        & $exe @rest -m venv $Venv
        if ($LASTEXITCODE -ne 0) { throw "could not create $Venv" }
    }
    $vpy = Join-Path $Venv "Scripts\python.exe"
    $pin = Select-String -Path (Join-Path $Source "pyproject.toml") `
        -Pattern "llama-cpp-python==[0-9.]+" -ErrorAction SilentlyContinue |
        ForEach-Object { $_.Matches[0].Value } | Select-Object -First 1
    $build = Join-Path $Venv ".warmstart-build"
    if ((Want-Cuda) -and $pin -and ((Get-Content $build -ErrorAction SilentlyContinue) -ne "cuda $pin")) {
        Say "building $pin with CUDA (20 to 40 minutes)"
        $env:CMAKE_ARGS = "-DGGML_CUDA=on"
        # --no-cache-dir: a cached CPU wheel of the same version would be reused otherwise
        & $vpy -m pip install --no-cache-dir --force-reinstall --no-deps $pin
        if ($LASTEXITCODE -ne 0) { throw "the CUDA build of $pin failed" }
        Set-Content $build "cuda $pin"
    }
    Say "installing warmstart from $Source (llama-cpp-python compiles the first time: 10-20 min)"
    & $vpy -m pip install --disable-pip-version-check --upgrade `
        --upgrade-strategy only-if-needed "$Source[app]"
    if ($LASTEXITCODE -ne 0) { throw "pip could not install warmstart" }
    if (-not (Test-Path $build)) { Set-Content $build "cpu $pin" }
}

function Install-Command {
    New-Item -ItemType Directory -Force $BinDir | Out-Null
    Set-Content -Encoding ASCII $Shim "@`"$Exe`" %*"
    Set-UserPath $true
    $shell = New-Object -ComObject WScript.Shell
    $link = $shell.CreateShortcut($Shortcut)
    $link.TargetPath = $Exe
    $link.Arguments = "app"
    $link.Description = "Chat with a local model"
    $link.Save()
}

function Install-Task {
    $action = New-ScheduledTaskAction -Execute $Exe -Argument "serve"
    $trigger = New-ScheduledTaskTrigger -AtLogOn -User $env:USERNAME
    $settings = New-ScheduledTaskSettingsSet -RestartCount 3 `
        -RestartInterval (New-TimeSpan -Minutes 1) -ExecutionTimeLimit ([TimeSpan]::Zero)
    Register-ScheduledTask -TaskName $TaskName -Action $action -Trigger $trigger `
        -Settings $settings -Description "warmstart local API on 127.0.0.1:8765" -Force | Out-Null
    Start-ScheduledTask -TaskName $TaskName
    Say "the API runs at logon: http://127.0.0.1:8765/v1"
}

if ($Purge -and -not $Uninstall) { throw "-Purge goes with -Uninstall" }
if ($Uninstall) { Remove-Warmstart; exit 0 }
Install-Program
Install-Command
if ($Service -or (Get-ScheduledTask -TaskName $TaskName -ErrorAction SilentlyContinue)) { Install-Task }
if (-not $NoModel) {
    Say "pulling the default model (98 MB)"
    & $Exe models pull default
}
Write-Host ""
Write-Host "warmstart is installed ($(Get-Content (Join-Path $Venv '.warmstart-build')) build; untested on Windows)."
Write-Host "  command   $Shim (open a new terminal: it is on your user PATH)"
Write-Host "  program   $Venv"
Write-Host "  data      $Home_ (models, KV cache, conversations, warmstart.toml)"
Write-Host "  app       Start menu > warmstart"
Write-Host "Try: warmstart ask `"Why is the sky blue?`""
